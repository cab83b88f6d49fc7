"""Incidents domain: persistent conditions (slow GPU, node, link, hang) with their evidence."""
