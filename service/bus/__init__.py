"""NATS JetStream between stateless ingest replicas and the one replica that owns each job
(docs/replicas.md). Off unless ``FAILSLOW_BUS__URL`` is set: the embedded single process needs
none of it."""
