"""Terminal views: training progress, the chat REPL, attention maps, comparisons."""
