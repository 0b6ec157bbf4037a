"""An emulated network of PoPs on one machine: edge, regional and central tiers,
the links between them, and the control plane that deploys to all of them."""
