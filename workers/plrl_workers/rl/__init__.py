"""The RL objective: advantages, losses, sequence packing, one training step."""
