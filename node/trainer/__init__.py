"""The trainer role: verified rollouts in, GRPO updates, signed checkpoints out (issue 7)."""
