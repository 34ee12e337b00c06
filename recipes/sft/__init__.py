from recipes.sft.recipe import SFTConfig, SFTRecipe as Recipe

__all__ = ["Recipe", "SFTConfig"]
