from recipes.sao.recipe import SAOConfig, SAORecipe as Recipe

__all__ = ["Recipe", "SAOConfig"]
