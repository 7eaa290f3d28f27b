"""What was measured and decided: the Parquet results, override files, the reducer, publishing."""
