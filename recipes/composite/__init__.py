from recipes.composite.recipe import CompositeConfig, CompositeRecipe as Recipe

__all__ = ["Recipe", "CompositeConfig"]
