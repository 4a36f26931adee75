"""The projection store: the keyspace and value encodings (``keys.py``), the state document
the stored records join into and the forms it is read in (``document.py``), one partition's
RocksDB store (``partition.py``), and the state directory that holds a store per partition
(``statedir.py``)."""
