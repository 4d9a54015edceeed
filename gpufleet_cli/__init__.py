"""The `gpufleet` command: run the collection's playbooks through ansible-runner and show the fleet report."""
