"""`planner calibrate`: time collectives, matmuls and copies on the real cluster (measure), fit alpha-beta numbers (fit) and write a hardware profile (run, command)."""
