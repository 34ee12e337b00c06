from recipes.sdpo.recipe import SDPOConfig, SDPORecipe as Recipe

__all__ = ["Recipe", "SDPOConfig"]
