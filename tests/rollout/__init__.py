"""Two-phase deploys, canaries and rollouts across the PoPs of a topology."""
