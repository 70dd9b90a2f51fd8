"""driversdk: write Nomad-compatible task-driver plugins in Python."""
