"""Image preprocessing: decoding, and load-time augmentation."""
