"""A random-init base of a preset, saved as a course-layout BF16 state dict (speed probes only)."""

import sys

import torch

from cs336_basics.config import build_config
from cs336_basics.model import TransformerLM

preset, out = sys.argv[1], sys.argv[2]
cfg = build_config({"preset": preset})
torch.manual_seed(0)
m = TransformerLM(cfg.model).to(torch.bfloat16)
torch.save(m.state_dict(), out)
print("base", preset, sum(p.numel() for p in m.parameters()))
