"""Container runtime: how the agent runs task containers as processes on the host."""
