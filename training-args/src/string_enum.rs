//! The `string_enum!` macro: enums whose serde form, `Display` and `FromStr` are upstream's
//! string values, with a close-match error for unknown names.

/// Declares a `Copy` enum whose variants map one-to-one to upstream string values.
///
/// Generates `ALL`, `as_str`, `member_name`, `Display`, `FromStr` (error:
/// [`crate::Error::UnknownVariant`] with close matches) and string `Serialize` / `Deserialize`.
/// A variant whose upstream member name is not its value upper-cased names it with
/// `Variant = "value" as "MEMBER"`.
macro_rules! string_enum {
    (@member $value:literal) => {
        std::borrow::Cow::Owned($value.to_uppercase())
    };
    (@member $value:literal $member:literal) => {
        std::borrow::Cow::Borrowed($member)
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($upstream:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal $(as $member:literal)?, )+
        }
        default = $default:ident;
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in upstream's declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant, )+ ];

            /// Upstream's string value of this variant.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $value, )+
                }
            }

            /// Upstream's member name of this variant (`OptimizerNames.ADAMW_BNB`: what
            /// `str(member)` shows after the class name).
            pub fn member_name(self) -> std::borrow::Cow<'static, str> {
                match self {
                    $( $name::$variant => string_enum!(@member $value $($member)?), )+
                }
            }

            /// The enum's name upstream (`OptimizerNames`).
            pub const UPSTREAM_NAME: &'static str = $upstream;

            /// Upstream's string values of every variant, in declaration order.
            pub fn values() -> Vec<&'static str> {
                Self::ALL.iter().map(|v| v.as_str()).collect()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::Error;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                match s {
                    $( $value => Ok($name::$variant), )+
                    _ => Err(crate::Error::UnknownVariant {
                        enum_name: $upstream,
                        value: s.to_string(),
                        suggestions: crate::suggest::close_matches(s, Self::values()),
                        valid: Self::values().join(", "),
                    }),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use string_enum;
