"""`make bench`: Writ's command and run paths against the ceilings they are bounded by.

One run starts its own deployment (`writ.stack.Stack`: embedded nats-server with
`sync_interval: always`, PostgreSQL with durable commits, the six services as processes) in a
temporary folder, measures, prints each figure and writes them as JSON to `$BENCH_OUT`
(default `bench-results.json`).
"""
