"""`shoal demo`: the whole GPU-fleet story on simulated hosts (see shoal.demo.story)."""
