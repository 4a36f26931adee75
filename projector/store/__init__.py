"""The projection store: the keyspace and value encodings (``keys.py``), one partition's
RocksDB store (``partition.py``), and the state directory that holds a store per partition
(``statedir.py``)."""
