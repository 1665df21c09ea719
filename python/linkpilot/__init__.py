"""Training-side client of linkpilot.

- :mod:`linkpilot.board`: reads the daemon's knob board (standard library only).
- :mod:`linkpilot.codecs`: gradient codecs (none, fp16, bf16, int8, int4, top-k) with error
  feedback (torch).
- :mod:`linkpilot.ddp`: a DistributedDataParallel comm hook that follows the board (torch).
- :mod:`linkpilot.outer`: cross-site synchronization every H steps (DiLoCo family): compressed
  pseudo-gradients, fragments overlapped with inner steps, riding through outages (torch).
- :mod:`linkpilot.jobreport`: job reports, what the network costs each step, published for the
  daemon (standard library only).
- :mod:`linkpilot.tuner`: the NCCL tuner plugin's gate, where the ranks' agreed NCCL rule is
  adopted, and a check that NCCL can load the plugin (standard library only).
- :func:`init_process_group`: loads the daemon's NCCL env file, then initialises torch.distributed.
"""

from linkpilot.board import (
    BoardBusy,
    BoardError,
    BoardFormatError,
    BoardMissing,
    BoardSnapshot,
    KnobBoard,
    LinkKnobs,
)
from linkpilot.envfile import EnvFileError, EnvFileMissing, init_process_group, load_env_file

__all__ = [
    "BoardBusy",
    "BoardError",
    "BoardFormatError",
    "BoardMissing",
    "BoardSnapshot",
    "EnvFileError",
    "EnvFileMissing",
    "KnobBoard",
    "LinkKnobs",
    "init_process_group",
    "load_env_file",
]
