"""The rack's own cores besides the engines (`workloads.core`): the router (admission,
routing, closed loop, fault recovery), the metrics collector, the fault injector, and
the admission rules they apply."""
