from accelerate import Accelerator, LocalSGD

print(f"{LocalSGD.__module__}.{LocalSGD.__name__}", Accelerator.__name__)
