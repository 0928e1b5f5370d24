"""``metricbus demo``: the embedded stack, a real PPO run on CartPole, and the archive read back.

This room owns the demo's script (``_demo``) and the small, real PPO it trains (``_ppo``,
after cleanrl's ``ppo.py``), which needs the ``demo`` extra (torch, gymnasium).
"""

from ._demo import run_demo

__all__ = ["run_demo"]
