"""`make soak`: a Writ deployment of its own under an open-loop load and a seeded nemesis, then a
checker of the invariants (docs/design.md §3) over what the fakes, the registry and the journal
recorded. Like `bench/`, a harness that starts its own deployment; it is not imported by Writ.

Modules: `settings` (the SOAK_* environment), `deploy` (the deployment, its replicas and its
supervisor; `cluster` for three nats-server nodes), `load` (the open-loop mix and the scripted
approver), `nemesis` (the seeded schedule of faults), `observe` (memory, descriptors and
Postgres connections), `check` (the invariants), `__main__` (the whole soak).
"""
