"""One job's join and frames across processes: shards by communicator, reduced by the owner.

The process that owns a job keeps ingest (HTTP, decode, the checks on arrays, step records and
their answers, the event clock, counters) and detection; with ``FAILSLOW_STATE__SHARDS=N`` a job
of at least ``shard_min_ranks`` ranks also has ``N`` shard processes, each holding the join and
the frame sums of the communicators ``comm % N``. Member records go to their comm's shard, step
records to every shard (their placement needs each rank's step intervals). A detection pass asks
every shard to join and close the frames that are due — each closes the same ones, decided by the
same step records and the owner's watermark — and adds the partial frames up: the accumulators are
sums over collectives, so the sum of the shards' frames is the frame one process would have built
(tests/service/stream/test_shards.py compares them). docs/ingest-v2.md, "One job across
processes".
"""
