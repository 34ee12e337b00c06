from recipes.tttd.recipe import TTTDRecipe as Recipe

__all__ = ["Recipe"]
