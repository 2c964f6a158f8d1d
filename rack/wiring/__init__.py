"""From a scenario to a run: the scenario and its settings (pydantic, from TOML), the
sizing of its pools, the topology of cores a run needs (faults included), and the
runner that drives them on either runtime and assembles `results.json`."""
