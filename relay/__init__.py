"""The relay: a process in front of a rack (or any group) of node agents that gathers their v2
envelopes into ``POST /v2/ingest/bundle`` requests to the service and answers each agent with
its own item (docs/relay.md). Agents point ``--service`` at it and change nothing else.

What one HTTP request costs the service whatever it carries is several times what a host's
envelope costs it to apply, so at 10K ranks and more the service's CPU goes mostly to requests;
a relay takes that cost onto its own cores, where it is spread over as many relays as there are
racks. Independent of the service and of the agents: it speaks only the wire
(:mod:`failslow.wire`).
"""
