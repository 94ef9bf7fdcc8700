"""How feedline shows itself: reprs, notebook views, progress bars and charts."""
