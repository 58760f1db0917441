"""Generation and training engines behind small protocols; heavy imports stay inside adapters."""
