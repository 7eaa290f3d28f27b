"""What is tuned: problems, ops, knobs, dtypes, ids, plan specs, the engine contract, workloads, records."""
