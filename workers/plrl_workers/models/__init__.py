"""Model construction that needs no download: the built-in tiny model and its tokenizer."""
