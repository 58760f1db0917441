"""Built-in tasks, their reward functions and the built-in tiny model and tokenizer."""
