from recipes.basic.recipe import BasicRecipe as Recipe, BasicConfig

__all__ = ["Recipe", "BasicConfig"]
