"""The fault lab's building blocks: network namespaces on a bridge with throttled links, CPU
quotas with cgroup v1, and a preflight that says what is missing. Linux and root only."""
