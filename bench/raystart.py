"""Seconds of a local Ray start and of two GPU actors' first reply (each importing torch and touching CUDA)."""
import time

import ray

t0 = time.perf_counter()
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False,
         object_store_memory=256 * 2**20)
t1 = time.perf_counter()


@ray.remote(num_gpus=0.5, num_cpus=0)
class Probe:
    def __init__(self):
        self.t = {"start": time.time()}
        import torch

        self.t["torch"] = time.time()
        import nbhelpers.pipeline  # noqa: F401

        self.t["nbhelpers"] = time.time()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        self.t["cuda"] = time.time()

    def times(self):
        return self.t


actors = [Probe.remote() for _ in range(2)]
t_sub = time.time()
times = ray.get([a.times.remote() for a in actors])
t2 = time.perf_counter()
print(f"ray.init {t1 - t0:.2f} s; actors ready {t2 - t1:.2f} s")
for t in times:
    print({k: round(v - t_sub, 2) for k, v in t.items()})
ray.shutdown()
print(f"shutdown {time.perf_counter() - t2:.2f} s")
