# frozen_string_literal: true

module TopologyClaims
  VERSION = "0.1.0"
end
