"""Tensor and data parallelism.

Tensor parallelism (``tp_size``) is a transform of the loaded plain model (``shard.py``, with the
combining layers in ``layers.py``) over a torch.distributed group (``parallel.py``: gloo on CPU,
NCCL on CUDA). Rank 0 is the scheduler process and broadcasts each ForwardBatch
(``batch_sync.py``); ranks > 0 run ``tp_worker.py`` and never touch the sockets.

Data parallelism (``dp_size``) runs independent replicas (``data_parallel.py``) behind a router
in the front process (``router.py``: cache-aware, round-robin, least-load).
"""
