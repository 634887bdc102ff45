"""Builders of the offline data sets, and the tokenizer trainer."""
