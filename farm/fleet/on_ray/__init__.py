"""The Ray farm's shell: the cluster and its start (cluster.py, ray_instance.py), workers and where they run
(launcher.py, worker.py, nodes.py, reaper.py), their streams into the driver (event_loop.py), a reduce on Ray
(distributed_reduce.py). The orchestration both executors share is farm.fleet's."""
