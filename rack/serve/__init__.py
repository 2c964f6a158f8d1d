"""Layer 6 of rack/: the live HTTP endpoint (`rack serve`): OpenAI and vLLM routes,
the gateway core that turns HTTP requests into the router's requests, the Ray front host
that runs the server in an actor, the live session around one served rack, limits,
tokenizer and Prometheus metrics, the load generator of `rack bench-serve`.

May import: rack.run, rack.runtime, rack.measure, rack.wiring, rack.serving (public
names only); devices, interconnect, workloads (docs/architecture.md).
"""
