"""How a Kafka broker starts: ``docker-compose.yml`` for users with Docker, and
:mod:`runstate.compose.kafka_local`, a real single-node KRaft broker from Maven Central
jars for machines without Docker (``python -m runstate.compose.kafka_local run``)."""
