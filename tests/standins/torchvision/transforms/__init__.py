"""Stand-in: only ``torchvision.transforms.functional`` (see ../__init__.py)."""
