"""Recipes: the data and training pipelines that build jspec's drafters from local data."""
