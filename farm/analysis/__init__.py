"""Reading results: farm report and farm diff."""
