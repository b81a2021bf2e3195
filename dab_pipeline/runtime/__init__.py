"""Where a stage runs: device resolution, what the device computes fast (and what every ``auto`` picks), and the
contexts of one process or of a torchrun job."""
