"""failslow's wire formats shared by the agents and the service: the v2 columnar envelope and
the host topology it refers to by digest. Imports nothing of the project but the vocabulary."""
