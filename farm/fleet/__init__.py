"""Many devices: the scheduler, the Ray farm, the job folder and its executors."""
