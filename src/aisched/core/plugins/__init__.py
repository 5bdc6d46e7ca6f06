"""Built-in plugins: job orders, filters, scores and victim selectors."""
