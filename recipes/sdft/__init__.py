from recipes.sdft.recipe import SDFTConfig, SDFTRecipe as Recipe

__all__ = ["Recipe", "SDFTConfig"]
