"""Text preprocessing: tokenizers and token id arrays."""
