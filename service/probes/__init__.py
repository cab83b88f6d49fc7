"""Active link probes: campaigns scheduled by the service and run by the node agents."""
