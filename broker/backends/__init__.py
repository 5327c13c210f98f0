"""Backend adapters behind the `broker.ports.backend.Backend` port.

`local`: bubblewrap sandboxes on this machine (or plain processes with --unisolated), GPUs from `gpus`
(NVML, or virtual ones). Import the adapter you need; this package imports nothing on its own.
"""
