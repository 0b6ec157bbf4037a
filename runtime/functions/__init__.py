"""Deployed functions: the manifest, the deploy store on disk, and the router."""
