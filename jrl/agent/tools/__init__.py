"""Tools an agent loop calls: verl's lifecycle (`BaseTool`), jrl's built-ins (GSM8K answer
checker, calculator, Python sandbox), function tools, and the tool config loader."""
