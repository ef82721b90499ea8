"""NVIDIA MPS on the host agent: `manager` runs and watches one MPS control daemon per GPU;
`fake_control` (with `fake_daemon`) is `shoal-fake-mps-control`, the stand-in binary that
simulated hosts use. Nothing is imported here, so the fake's front end starts fast."""
